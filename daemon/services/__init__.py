"""Layer 3, what starts or talks to a process: launchers (local, Ray), the stage commands and their
validation, ShopSim, the val server, the GPUs and the repo hygiene."""
