"""Users (SASL/SCRAM credentials) and ACLs in ZooKeeper: every broker of the cluster reads the same.

``<root>/metaq-security/users/<name>`` holds a user's hashed credential (JSON, :mod:`metaq.security.credentials`)
and ``<root>/metaq-security/acls`` the ACL document (JSON, :mod:`metaq.security.acl`), both persistent; the
ACL document is replaced only if it is unchanged since it was read (a version check).
"""

from __future__ import annotations

from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError

from metaq.cluster.registry import RegistryError, UserAclStore
from metaq.cluster.zookeeper.session import ZooKeeperSession, zk_error


class UserAclNodes(UserAclStore):
    """The cluster's users and ACLs (:class:`metaq.cluster.registry.UserAclStore`) as znodes."""

    def __init__(self, session: ZooKeeperSession) -> None:
        self._session = session
        self.paths = session.paths

    def read_user(self, name: str) -> bytes | None:
        """The stored credential of user ``name`` (JSON bytes, metaq.security), None if there is none."""
        try:
            return bytes(self._session.client.get(self.paths.user(name))[0])
        except NoNodeError:
            return None
        except KazooException as exc:
            raise RegistryError(f"cannot read user {name!r} from ZooKeeper: {zk_error(exc)}") from None

    def write_user(self, name: str, data: bytes) -> bool:
        """Store user ``name``'s credential (persistent); True if the user is new."""
        path = self.paths.user(name)
        try:
            try:
                self._session.create(path, data, makepath=True)
                return True
            except NodeExistsError:
                self._session.client.set(path, data)
                return False
        except KazooException as exc:
            raise RegistryError(f"cannot write user {name!r} to ZooKeeper: {zk_error(exc)}") from None

    def delete_user(self, name: str) -> bool:
        try:
            self._session.client.delete(self.paths.user(name))
            return True
        except NoNodeError:
            return False
        except KazooException as exc:
            raise RegistryError(f"cannot delete user {name!r} in ZooKeeper: {zk_error(exc)}") from None

    def list_users(self) -> list[str]:
        try:
            return self._session.children(self.paths.users)
        except KazooException as exc:
            raise RegistryError(f"cannot list the users in ZooKeeper: {zk_error(exc)}") from None

    def read_acls(self) -> tuple[bytes | None, int]:
        """The ACL document (JSON bytes, metaq.security.acl) and its version (-1: there is none)."""
        try:
            data, stat = self._session.client.get(self.paths.acls)
            return bytes(data), int(stat.version)
        except NoNodeError:
            return None, -1
        except KazooException as exc:
            raise RegistryError(f"cannot read the ACLs from ZooKeeper: {zk_error(exc)}") from None

    def write_acls(self, data: bytes, version: int) -> bool:
        """Replace the ACL document if it is still at ``version`` (-1: create it); False when it moved."""
        try:
            if version < 0:
                self._session.create(self.paths.acls, data, makepath=True)
            else:
                self._session.client.set(self.paths.acls, data, version=version)
            return True
        except (NodeExistsError, BadVersionError):
            return False
        except KazooException as exc:
            raise RegistryError(f"cannot write the ACLs to ZooKeeper: {zk_error(exc)}") from None
