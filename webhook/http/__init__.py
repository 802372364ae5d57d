"""The aiohttp shell: the app and its probes, the admission handler table, the GPU, scheduling and
admin APIs and their authorization."""
