"""project: the declared inputs (pins.yaml, recipes, bundles, floor.yaml, roots), loaded and schema-checked."""
