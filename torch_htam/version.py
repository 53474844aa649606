"""The package version, apart from the package root so modules can read it without importing
torch_htam/__init__.py (which would make every such module part of an import cycle)."""
__version__ = "0.1.0"
