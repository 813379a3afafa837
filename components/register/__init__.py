"""The register component."""
