"""The campaign file and what it names: sections, values, placeholders, templates, secrets, endpoints, roles, conda envs."""
