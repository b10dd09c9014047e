"""Everything that touches devices: meshes, programs, instances, sampling and KV transfer."""
