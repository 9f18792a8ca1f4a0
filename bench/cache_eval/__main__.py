from bench.cache_eval.run import main

raise SystemExit(main())
