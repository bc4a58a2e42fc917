"""jax + ray: build stage programs from layers, shard, compile, time and measure them."""
