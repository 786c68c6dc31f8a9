"""What a silo does with its own data: local SGD one silo at a time, or several silos as one
computation."""
