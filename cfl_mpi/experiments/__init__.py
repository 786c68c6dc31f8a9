"""Runs of several jobs that answer a question: methods side by side, the papers' tables and
figures."""
