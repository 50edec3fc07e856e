"""No models: pgtick's tables live in its own ``jobs`` schema, migrated by pgtick.

The module exists so that Django sends this app ``post_migrate`` (it sends it only to apps
with a models module): every ``manage.py migrate`` then brings the jobs schema up to the
installed pgtick (see ``apps.PgtickConfig.ready``).
"""
