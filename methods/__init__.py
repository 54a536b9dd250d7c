"""The benchmark's own method(s); importing this package registers them."""

from methods import fedgmc

__all__ = ["fedgmc"]
