"""The weekly release: tag, changes and notes, Lemonade archives and install, SBOM, publishing."""
