"""The web preview: a small page with the live annotated stream and live pipeline statistics."""
