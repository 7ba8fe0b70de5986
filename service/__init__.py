"""The pipetune tuning service: FastAPI app (service.app.create_app), database, job queue,
task driver and dashboard. Imports model and tuner, never workers or clients."""
