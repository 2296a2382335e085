"""The demo stack: stand-ins for ShopSimulator, slime, the ShopSimRL tools and SGLang."""
