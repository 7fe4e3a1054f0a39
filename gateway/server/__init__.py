"""The outermost layer around the app: the guarded HTTP protocol, the exchange middleware that
sees the status each client got, and the SIGTERM drain."""
