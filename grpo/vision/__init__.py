"""Procedural images (the shapes world) and a pixel-statistics verifier; nothing learned, nothing downloaded."""
