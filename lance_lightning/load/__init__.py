"""Loading: the torch datasets, the DataLoader, its worker processes and the move to the device."""
