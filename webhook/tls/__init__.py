"""TLS for the admission server, in two parts (as controller-runtime keeps its certwatcher apart):

- `issuing`: ECDSA keys, the CA, serving and client certificates, and writing them to files;
- `watcher`: the server and client SSL contexts, and `CertWatcher`, which reloads a rotated
  certificate from disk without a restart.

The `certs` command that writes a CA and a serving certificate is `webhook.certs_cli`.
"""
