"""Agents: multi-turn episodes with environments and tools."""
