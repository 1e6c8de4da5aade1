"""The discrete-event simulator: a simulated engine and the run loop on a virtual clock."""
