"""What keeps silos' data from others: the keys silos agree without the server (X25519 pair
handshakes and the seeds HKDF derives), and client-level differential privacy of the cluster
models with its accountant."""
