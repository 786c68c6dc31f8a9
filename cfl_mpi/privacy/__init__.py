"""The keys silos agree without the server: X25519 pair handshakes and the seeds HKDF derives."""
