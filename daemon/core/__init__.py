"""Layer 5 (above shoprld.states, layer 4), the runtime: the engine applies the machine's decisions; its
event sources, children, attempts, the disk watch, alerts, metrics, the control socket and sd_notify."""
