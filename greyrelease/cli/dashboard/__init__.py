"""``kubectl gr dashboard``: a web page of the GreyReleases of a namespace (or all), live, with buttons that
steer them, served on this machine by the plugin with the user's own credentials (nothing is installed in
the cluster).

- :mod:`.views`: what the page shows, as pure functions of the objects (and the history kept of them).
- :mod:`.feed`: the objects, kept current by watches of the API server.
- :mod:`.server`: the HTTP server (aiohttp): the page, a JSON API, a stream of server-sent events, and the
  actions, each the plugin's own code path (:func:`greyrelease.cli.plugin.steer`).
- ``static/``: the page (``index.html``, ``dashboard.js``) and the charting library it draws with, uPlot
  1.6.32 (MIT; its licence beside it, ``uPlot.LICENSE``), vendored: nothing is fetched or built when the page
  loads. Another release of uPlot: ``npm pack uplot@<version>``, then ``dist/uPlot.iife.min.js``,
  ``dist/uPlot.min.css`` and ``LICENSE`` from the archive copied over these.
"""
