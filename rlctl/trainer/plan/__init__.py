"""What the run will use, decided on the driver from the profile and the resolved platform: the
concrete ``auto`` choices and the picklable spec each worker role is built from."""
