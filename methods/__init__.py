"""The benchmark's own method(s); importing this package registers them."""
