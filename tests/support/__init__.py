"""Test helpers shared by every test folder: servers, S3 backends, clients, fixtures' machinery."""
