"""Devices and the boundary with torch: what differs between cpu, cuda and meta, and torch's private names."""
