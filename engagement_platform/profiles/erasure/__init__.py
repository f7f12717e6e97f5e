"""Profile erasure stream: profile.erasure -> a tenant's identity out of every profile table, and on the suppression list."""
