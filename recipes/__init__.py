"""The recipes (`<name>.yaml`, one per run family), shipped in the wheel as package data of `packtrain.recipes`
(pyproject maps this directory there); `packtrain.config.recipe_dir()` finds them through this package, in a
checkout and in an installed wheel alike."""
