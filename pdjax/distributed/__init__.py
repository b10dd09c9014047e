"""Instances in their own processes (cluster.launcher = "ray"): see launcher.py."""
