"""Neural-network layers, optimizers, weights I/O and datasets."""
