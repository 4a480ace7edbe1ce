"""The operator's web UI: its response models (`schemas`) and its pages (`static/`: plain HTML, ES
modules and CSS, served as they are; no build step). The routes are in `api.routes.ops`."""
