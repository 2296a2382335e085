"""Campaign recipes and the demo stack (shipped as shoprld.recipes)."""
