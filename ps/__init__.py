"""The system as a whole: proxy, local cluster launcher, reference simulation."""
