"""What the unit tests share, imported by them (no test module imports another one):

- ``builders``: the objects the tests put on the in-memory API server (a release of ``web`` on its Deployment and
  Service) and what the control plane does between two passes;
- ``faults``: the controller killed before a write, errors from the API server, a store a watch event behind;
- ``world``: the planner's inputs and the adapters' effects, for driving the pure planner through whole releases;
- ``governance``: windows, freezes, the rules of policies and a :class:`~tests.support.world.World` under them.
"""
