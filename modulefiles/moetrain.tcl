#%Module moetrain 0.1.0
