"""Loading: the torch datasets, the DataLoader and its worker processes."""
