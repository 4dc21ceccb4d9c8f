"""Devices and the boundary with torch: the cpu, cuda and meta profiles, the GPU specs planned for,
torch's private names, the environment of child processes."""
