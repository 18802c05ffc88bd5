# dtrain_add_plugin() — filled in below
