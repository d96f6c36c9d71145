"""Key-value stores for the dataset cache (Bagua's ``contrib.utils``)."""
