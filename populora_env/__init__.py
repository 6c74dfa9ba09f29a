"""populora-env: population-based teacher/student self-play with verifiable rewards."""
