"""What travels between parties: typed messages behind a JSON header, never pickle."""
