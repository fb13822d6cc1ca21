"""Models: the catalog, the store and its downloads (hub and mirror), pairs of one's own,
and recommendations."""
