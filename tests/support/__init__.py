"""What the tests and bench/ share: real stacks on loopback (harness), the fingerprint's
test nginx (fp_nginx), Redis topologies, a fake upstream API, the golden vectors' readers,
a small HF checkpoint and a hostile slot writer. Imported as `tests.support.<module>`
(pytest's `pythonpath` puts the checkout root and engine/ first; bench/ runs as
`python -m bench.<script>` from the root). Nothing here imports a test module or bench/."""
