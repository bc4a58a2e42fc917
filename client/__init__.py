"""What a user imports: trace a JAX loss into a `ModelSpec`, the model zoo, the HTTP SDK, the CLI.

Heavy parts (jax) are imported lazily so `import client` stays light.
"""
