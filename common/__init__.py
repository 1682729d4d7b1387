"""The ground floor: what every layer may import, importing nothing of the project.

Named errors, the generated protocol code (`v1/`), and small shared types."""
