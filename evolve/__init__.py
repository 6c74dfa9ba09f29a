"""Population-based training with weight-space operators around any policy."""
