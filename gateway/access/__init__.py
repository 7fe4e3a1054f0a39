"""Access: API keys (stored as HMAC, rotated, revoked), authentication of a bearer, the admin
key operations shared by the admin API and the CLI, failed-login throttling and dashboard
sessions."""
