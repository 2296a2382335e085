"""What the ShopSimRL tools print and write, and why a stage failed."""
