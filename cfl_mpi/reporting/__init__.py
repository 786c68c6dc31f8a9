"""What a run leaves for a person: its results folder and plots."""
