"""Data sources (one module each) and the input pipeline they share."""
