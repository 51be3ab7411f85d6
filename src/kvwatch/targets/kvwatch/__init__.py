"""kvwatch's own engine as a gate target: ``kvwatch serve`` per profile, probed over HTTP,
with a cache-off reference engine for the equivalence replay."""
