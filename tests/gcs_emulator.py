"""A local Google Cloud Storage server for the gs:// tests: PyPI `gcp-storage-emulator` on
127.0.0.1, with the one response header it leaves out that tensorstore (Orbax's writer) needs.

Real GCS answers a media download with `x-goog-generation` (the object's generation);
tensorstore's gcs driver reads it to know which version it read, and with the header missing
every read of an existing object fails ("Malformed StorageGeneration", first on OCDBT's
manifest). The emulator keeps the generation in the object's metadata; `download` here adds
it as the header, nothing else changes.

  python tests/gcs_emulator.py --port 9023 --bucket bkt   # serves until killed

Clients point at it with STORAGE_EMULATOR_HOST (gcsfs, google-cloud-storage),
TENSORSTORE_GCS_HTTP_URL (tensorstore) and GOOGLE_AUTH_TOKEN_FOR_TESTING (tensorstore's
credentials): `client_env(port)`.
"""

import argparse
import time

CLIENT_ENV = ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL")


def client_env(port: int) -> dict[str, str]:
  """Environment that sends gcsfs and tensorstore to the emulator on `port`, without
  credentials lookups (gcsfs: anonymous; tensorstore: a fixed test token)."""
  url = f"http://127.0.0.1:{port}"
  return {
    **{k: url for k in CLIENT_ENV},
    "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
    "FSSPEC_GCS_TOKEN": "anon",  # fsspec's per-protocol config from the environment
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",  # no bucket-type lookup (it needs credentials)
  }


def _with_generation_header(download):
  def handler(request, response, storage, *args, **kwargs):
    download(request, response, storage, *args, **kwargs)
    try:
      obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except Exception:  # not found: the wrapped handler has answered 404
      return
    response["x-goog-generation"] = str(obj["generation"])
    response["x-goog-metageneration"] = str(obj.get("metageneration", "1"))

  return handler


def serve(port: int, bucket: str):
  from gcp_storage_emulator import server
  from gcp_storage_emulator.handlers import objects

  patched = _with_generation_header(objects.download)
  for _, handlers in server.HANDLERS:
    for method, fn in list(handlers.items()):
      if fn is objects.download:
        handlers[method] = patched
  objects.download = patched  # `get(..., alt=media)` calls it by module name
  s = server.create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket)
  s.start()
  print(f"gcs emulator on 127.0.0.1:{port}, bucket {bucket}", flush=True)
  while True:
    time.sleep(3600)


if __name__ == "__main__":
  p = argparse.ArgumentParser()
  p.add_argument("--port", type=int, required=True)
  p.add_argument("--bucket", required=True)
  a = p.parse_args()
  serve(a.port, a.bucket)
