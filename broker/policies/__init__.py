"""What operators set to shape the objects: policies and operator policies, vhost and user limits."""
