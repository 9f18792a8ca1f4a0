"""Request preparation (the event loop): a ring to a prepared request, the endpoints, how a request ends."""
